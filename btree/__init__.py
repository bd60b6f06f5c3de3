"""btree"""
