"""Synthetic procedure videos with exact ground truth: test data, demo data and the synthetic
evaluation set. Every frame carries its index as a barcode (`synth.barcode`), so a decoder's
output can be checked frame by frame.

    synthesize(out_path, minutes, seed, ...) -> SynthVideo          synth.video
"""
