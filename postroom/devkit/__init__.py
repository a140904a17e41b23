"""What the demo, the tests and the benchmarks share to drive postroom on a local stack.

Part of the base layer: it imports nothing from relay/ or sender/, and no role imports it.
"""
