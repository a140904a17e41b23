"""What the demo, the tests and the benchmarks share to drive postroom on a local stack.

It imports only the base (postroom.settings, postroom.kafka, ...), never relay/, sender/ or an
entry point; no role imports it.
"""
