"""The sweep: a config's checked plan, running its points, Table 1, tables, aggregation."""
