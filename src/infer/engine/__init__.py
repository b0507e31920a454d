"""The engine: requests, scheduling, one pure-compute step at a time, detokenized outputs."""
