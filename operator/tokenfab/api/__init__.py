"""The tokenfab API: custom resource models, their validation rules and the CRD generated from them."""
