"""Benchmarks (commands, not tests): they print ratios measured side by side in one run."""
