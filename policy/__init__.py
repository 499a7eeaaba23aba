"""trainstack's security rules: plain functions over resources, shared by the tests and the policy pack.

`policy.rules` holds the rules (stdlib only, so the policy pack's own virtualenv can import
it), `policy.iam` finds the AWS policy documents a stack produces and lints them with
parliament, `policy/__main__.py` is the Pulumi policy pack that calls the same rules.
"""
