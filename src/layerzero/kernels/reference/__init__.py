"""PyTorch reference implementations: the correct fallback for every layerzero op, on any device."""
