"""The autoscaler's decisions, pure: inference deployments and elastic training jobs. Never imports I/O.

- `model`: deployments (replica bounds, GPU shape, metric targets, scale to zero, cold start),
  replicas, metric samples, `ScalingRequest` / `ScalingReply` and the memory carried between calls.
- `policies`: `decide(ScalingRequest) -> ScalingReply` and the registry of policies by name.
- `reactive`: the HPA formula with tolerance, stabilisation windows, rate limits, bounds, scale to zero.
- `forecast` + `predictive`: an online additive Holt-Winters forecast of the request rate; scales up
  one cold start ahead of a predicted rise, never below reactive, reactive alone while untrusted.
- `elastic`: `decide_elasticity(ElasticityRequest) -> ElasticityReply` for elastic training jobs.

docs/autoscaling.md has the formulas, the defaults and why, and the measured comparison.
"""
