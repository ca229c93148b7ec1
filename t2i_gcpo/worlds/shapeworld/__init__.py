"""ShapeWorld: the embedded offline miniature of GenEval (docs/worlds/shapeworld.md).

Coloured shapes on a #999999 canvas, prompts in GenEval's six templates and metadata schema, a
renderer that draws scenes satisfying their metadata, and a detector that reads objects back from
pixels so the GenEval rules (t2i_gcpo.scoring.geneval_rules) score generated images.
"""

from t2i_gcpo.scoring.geneval_classes import geneval_classes
from t2i_gcpo.worlds.shapeworld.constants import (
    BACKGROUND_HEX,
    BACKGROUND_RGB,
    COLOR_RGB,
    COLORS,
    NUMBER_WORDS,
    RELATIONS,
    SHAPES,
    TAGS,
)
from t2i_gcpo.worlds.shapeworld.parse import (
    geneval_plural,
    metadata_to_prompt,
    parse_prompt,
    validate_metadata,
)
from t2i_gcpo.worlds.shapeworld.prompts import (
    all_metadata,
    generate_metadata,
    make_splits,
    read_prompt_file,
    write_prompts,
)
from t2i_gcpo.worlds.shapeworld.render import ShapeObject, object_masks, render, sample_scene, token_grid_mask

__all__ = [
    "BACKGROUND_HEX",
    "BACKGROUND_RGB",
    "COLORS",
    "COLOR_RGB",
    "NUMBER_WORDS",
    "RELATIONS",
    "SHAPES",
    "TAGS",
    "ShapeObject",
    "all_metadata",
    "generate_metadata",
    "geneval_classes",
    "geneval_plural",
    "make_splits",
    "metadata_to_prompt",
    "object_masks",
    "parse_prompt",
    "read_prompt_file",
    "render",
    "sample_scene",
    "token_grid_mask",
    "validate_metadata",
    "write_prompts",
]
