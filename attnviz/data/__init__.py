"""What attention data is, apart from any model: the Capture (capture.py), an encoder-decoder model's Parts
(parts.py), the .npz format's limits and checks (npzformat.py) and the parts of a capture (sides.py). numpy
only: the trust boundary for shared files.
"""
