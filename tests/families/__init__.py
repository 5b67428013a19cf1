"""One file per family: parity with transformers (and TransformerLens where it has the family) on tiny random
checkpoints, and what is specific to the family. What every family's test shares is parity.py."""
