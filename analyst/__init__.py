"""The analyst side (the SDK an analyst installs, trusted by no server): the
oracle interface and its local and remote implementations, the selection
algorithms (`selection`), the applications, the aggregation and central
baselines, and the statistical privacy audit.  Noise models and samplers live in
`svtagg.dp`; the paper's experiments in `svtagg.experiments`."""
