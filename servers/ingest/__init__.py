"""Report ingest: uploads whose validity the two servers verify together
(`batches`) and the validity circuits a task names (`validity`)."""
