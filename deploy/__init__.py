"""Wiring: the root CLI, demo, simulation, local launch and workloads — the only
package that imports every role."""
