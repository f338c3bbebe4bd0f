"""Test data and helpers shared by the unit tests (tests/) and the end-to-end tests (e2e/), which import
this package and never each other: the examples and the invalid-spec table (cases), the Helm chart's
renders (chart)."""
