"""A file system on MetaFlow: the core (`core`) and its FUSE mount (`mount`)."""
