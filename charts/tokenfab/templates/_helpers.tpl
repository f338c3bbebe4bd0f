{{/* Names, labels and the operator's arguments. */}}

{{- define "tokenfab.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tokenfab.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tokenfab.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tokenfab.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tokenfab.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "tokenfab.labels" -}}
helm.sh/chart: {{ include "tokenfab.chart" . }}
{{ include "tokenfab.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: tokenfab
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "tokenfab.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tokenfab.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tokenfab.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* The operator's arguments, after .Values.command. */}}
{{- define "tokenfab.args" -}}
- --liveness
- {{ printf "http://0.0.0.0:%d/healthz" (int .Values.health.port) | quote }}
- --leader-elect
{{- if .Values.metrics.enabled }}
- --metrics-port
- {{ .Values.metrics.port | quote }}
- --metrics-addr
- "0.0.0.0"
{{- end }}
{{- if eq .Values.logLevel "debug" }}
- --verbose
{{- end }}
{{- range .Values.watchNamespaces }}
- --namespace
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* Cross-field rules the JSON schema cannot say clearly: fail with a message that names the fix. */}}
{{- define "tokenfab.validate" -}}
{{- if and .Values.metrics.enabled (eq (int .Values.metrics.port) (int .Values.health.port)) }}
{{- fail (printf "metrics.port and health.port are both %d: give /metrics and kopf's /healthz different ports" (int .Values.metrics.port)) }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled .Values.podMonitor.enabled }}
{{- fail "serviceMonitor.enabled and podMonitor.enabled are both true: Prometheus would scrape the operator twice; enable one of them" }}
{{- end }}
{{- if and (or .Values.serviceMonitor.enabled .Values.podMonitor.enabled) (not .Values.metrics.enabled) }}
{{- fail "serviceMonitor/podMonitor need the operator's metrics: set metrics.enabled to true" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.metrics.service.enabled) }}
{{- fail "serviceMonitor.enabled needs the metrics Service: set metrics.service.enabled to true (or use podMonitor)" }}
{{- end }}
{{- end }}
