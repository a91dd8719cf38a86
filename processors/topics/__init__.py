"""Topics: retained events at dense positions, read in pages with opaque cursors."""
