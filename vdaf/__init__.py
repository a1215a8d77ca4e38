"""Prio3 validity proofs (draft-irtf-cfrg-vdaf-07): the fields, the XOF, the
generic fully linear proof and the Prio3 VDAF with its Count, Sum, SumVec and
Histogram instances; a leaf layer (numpy and hashlib only)."""
