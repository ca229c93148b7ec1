"""Draw where each credit scheme puts a sample's credit, from Python.

    python examples/credit_map.py [OUT]                      # default OUT: runs/example-credit-maps

Writes one PNG per prompt and credit_maps.html (open it in a browser), and prints each scheme's
credit lift: its share of credit on the prompt's objects over their share of the image (1 = uniform).
"""

import sys

from t2i_gcpo import api


def main(out: str = "runs/example-credit-maps") -> None:
    summary = api.credit_maps(
        ["a photo of a circle left of a square", "a photo of two green triangles"],
        out,
        model="shapeworld",
        schemes=("gcpo", "uniform"),
        group_size=4,
        seed=0,
    )
    print(summary)


if __name__ == "__main__":
    main(*sys.argv[1:])
