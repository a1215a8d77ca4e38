"""The leader ↔ helper exchange, free of any transport: its domain values
(`values`), the comparison sessions (`session`), jointly drawn noise
(`joint`), the garbling scheme (`garbling`), and the port through which the
leader reaches the helper (`port`, with the in-process `memory` port)."""
