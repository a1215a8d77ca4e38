"""The analyst side: noise models and exact samplers, SVT mechanisms, the oracle
interface and its local and remote implementations, the selection algorithms,
applications, baselines, experiments and the command line."""
