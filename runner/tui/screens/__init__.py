"""Console screens: instances, detail, side views and dialogs."""
