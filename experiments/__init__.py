"""The paper's experiments, a layer above the analyst SDK (it is not part of what
an analyst installs to run queries): Figure 1 (selection error against d and n on
planted data), selection on real word frequencies, query counts, and the §7
applications, each next to its baselines.

Modules: `common` (data, the exponential mechanism's exact error, plotting
helpers), `figure1`, `words`, `queries`, `applications`, and `cli` (`svtagg
experiment ...`).  The figures need matplotlib, which is not a core dependency:
`pip install 'svtagg[experiments]'`.
"""
