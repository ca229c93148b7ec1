"""Visual side of credit assignment.

- credit_map: `weight_overlay`, `credit_figure`, `write_credit_html` (token-weight grids over images)
- token_heatmap: `token_heatmap_html`, `write_token_heatmaps` (token weights over text)
- text_heatmap: `TextSample`, `text_heatmap_html`, `write_text_heatmap` (completions × credit schemes,
  first wrong step outlined)
- lift: `credit_lift`, `mean_credit_lift`, `lift_table` (docs/worlds/shapeworld.md#credit-lift: is credit on
  the prompt's objects?)
- report: `write_run_report` (the self-contained HTML report of a run directory)
"""
