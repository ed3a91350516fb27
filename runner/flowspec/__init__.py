"""What a flow is: the YAML's models, the loader with positions, graph checks, policies, the
compiled flow (a ``transitions`` machine), its graph text, the JSON Schema, and the registry
of a flows folder. Pure: nothing here touches the database."""
