"""`python -m t2i_gcpo.worlds.shapeworld` regenerates the shipped prompt files (t2i_gcpo/prompts/)."""

from t2i_gcpo.worlds.shapeworld.prompts import main

main()
