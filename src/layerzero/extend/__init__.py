"""Extending layerzero: kernel plugins, capabilities descriptors, torch.library custom ops, the transformers integration."""
