"""Speculative decoding: proposals (n-gram prompt lookup, a draft model), verification by
rejection sampling, and the configuration. docs/design.md ("Speculative decoding") has the
step-by-step picture."""
