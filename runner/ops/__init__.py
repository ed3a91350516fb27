"""What the CLI, the console and rules ask of instances: operator commands (applied in one
transaction against the status lifecycle), the read side (listing, counts, detail), and
worker liveness."""
