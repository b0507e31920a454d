"""layerzero: kernel orchestration."""
