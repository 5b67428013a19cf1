"""The attention paths: the Triton kernel against its plain-torch reference, which path runs, and sliding
windows and softcaps on each."""
