"""Pure scheduling arithmetic: no I/O, no clock reads, no global randomness.

Everything here takes ``now`` as an argument and randomness as an injected
``random.Random`` so the same rules serve the asyncio scheduler and the SimPy lab.
"""
