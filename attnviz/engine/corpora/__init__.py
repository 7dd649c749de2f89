"""A corpus through the model, on the torch side: padded, length-sorted batches in this process (run.py), or
spread over Ray Data (ray.py). The statistics themselves are numpy, in attnviz.corpora."""
