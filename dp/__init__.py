"""The DP core: numbers, stream kinds, exact samplers, SVT mechanisms, accuracy,
ledgers, task parameters and the one refusal hierarchy.  Imports only `svtagg.mpc.ring`."""
