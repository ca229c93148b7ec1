"""GenEval scoring primitives shared by rewards, worlds and the eval runners.

The detection record, GenEval's 80 COCO class names, the rules engine (strict score and partial-credit
reward), the Mask2Former detector and the CLIP colour classifier. This package sits below
`t2i_gcpo.worlds` and `t2i_gcpo.rewards` and imports neither (see tests/test_layers.py).
"""
