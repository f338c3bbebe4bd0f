-- Argo CD health check for tokenfab.dev/ModelDeployment (resource.customizations.health.tokenfab.dev_ModelDeployment).
-- Reads the operator's status: observedGeneration and the Ready, Progressing, Degraded and Placed conditions.
--   Healthy      Ready=True and nothing Degraded, for the current generation
--   Degraded     Degraded=True (a group failed, or not enough NVLink capacity), or Placed=False (groups
--                that cannot be placed: no capacity, a blocked rollout, or no ComputeDomain support)
--   Progressing  no status yet, the operator has not seen the latest spec, or groups are still starting
-- Plain Lua 5.1 (Argo CD runs gopher-lua): no goto, no integer division, no libraries beyond the basics.
local hs = {}

local function condition(conditions, type_)
  if conditions == nil then
    return nil
  end
  for _, c in ipairs(conditions) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end

local function describe(c)
  if c == nil then
    return ""
  end
  local text = (c.reason or "")
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the tokenfab operator to report status"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the tokenfab operator to observe generation " .. tostring(generation)
  return hs
end

local conditions = obj.status.conditions
local ready = condition(conditions, "Ready")
local degraded = condition(conditions, "Degraded")
local placed = condition(conditions, "Placed")
local progressing = condition(conditions, "Progressing")

if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded)
  return hs
end

if placed ~= nil and placed.status == "False" then
  hs.status = "Degraded"
  hs.message = describe(placed)
  return hs
end

if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready)
  return hs
end

hs.status = "Progressing"
if ready ~= nil then
  hs.message = describe(ready)
elseif progressing ~= nil then
  hs.message = describe(progressing)
else
  hs.message = "Waiting for the Ready condition"
end
return hs
