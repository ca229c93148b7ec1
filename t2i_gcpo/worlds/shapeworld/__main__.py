"""`python -m t2i_gcpo.worlds.shapeworld --out prompts/` regenerates the shipped prompt files."""

from t2i_gcpo.worlds.shapeworld.prompts import main

main()
