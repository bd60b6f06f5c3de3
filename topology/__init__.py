"""Pure topology code: builders, the layer/pod classifier and the mapping onto the logical B-tree."""
