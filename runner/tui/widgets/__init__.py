"""Console widgets: the virtual instances table and the status header."""
