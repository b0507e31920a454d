"""Model code: shared layers and one module per family, every kernel through layerzero."""
