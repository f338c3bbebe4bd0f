"""The tokenfab API: the custom resources' models, their validation rules and the CRDs generated from them.

- `cel`: the kinds of rule (each a CEL expression for the API server and its Python twin, with one
  message), the patterns both read alike and the API server's quoting.
- `rules`: the rules on single fields and small objects.
- `models`: the pydantic models of ModelDeployment and NVLinkDomain (a package, one module per concern),
  with the spec's cross-field rules beside the spec.
- `crd`: the CustomResourceDefinitions, generated from the models.
- `errors`: parsing manifests, and wording the models' refusals as the API server words them.

Inside, imports go one way: cel <- rules <- models <- crd, errors. This is the lowest layer of tokenfab: it
imports nothing else from tokenfab and does no I/O (import-linter holds both), and every other package may
import it.
"""
