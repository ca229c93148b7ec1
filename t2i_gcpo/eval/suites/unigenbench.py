"""UniGenBench++ (Wang et al. 2025, "UniGenBench++: A Unified Semantic Evaluation Benchmark for Text-to-Image
Generation", arXiv 2510.18701): 600 prompts, each with 1–10 testpoints (10 primary dimensions, 27
sub-dimensions) a VLM judge scores 0/1 per image. From CodeGoat24/UniGenBench eval/src/eval_common.py (commit
49d0bcebb0b9418d975d3957c2fee10f34811d14; its data and prompts CC BY 4.0, Tencent).

Data: one of the repository's CSV files, ``data/test_prompts_en.csv`` (and ``_en_long``, ``_zh``,
``_zh_long``): columns ``index``, ``prompt_en`` (``prompt_zh``) and ``sub_dims_en`` (``sub_dims_zh``), a JSON
object whose ``Testpoints`` (``考点``) and ``Testpoint Description`` (``考点对应描述``) are the checkpoints
and what each means in this prompt, ``Primary Categories`` (``一级垂类``) its theme (the rows' category).
Question: the reference's template of the language, built as its ``build_system_prompt`` builds it (each
checkpoint's definition from its table, each one's description in this prompt; the checkpoint list printed as
a Python list), sent as one user message with the image first, as its vLLM client does for the UniGenBench
evaluation model, temperature 0, at most 4096 tokens. Score rule: ``<analysis>[…]</analysis>`` and
``<score>[…]</score>`` read as literals, both lists of one entry per checkpoint, else asked again (the
reference retries up to 10 times); each score must be 0 or 1 (the reference counts any other value as 0: here
it is a lie, asked again). An image scores the share of its checkpoints met. Aggregation: a checkpoint
"Primary - Secondary" counts for its primary dimension (the text before the first "-") and for itself; a
dimension's accuracy is its met checkpoints / its checkpoints over every image; ``overall`` is the mean of the
primary dimensions' accuracies (the leaderboard's Overall). Reference layout for ``--score-only``:
``DIR/<index>_<image>.png``, 4 images per prompt.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from t2i_gcpo.errors import UserError, shorten
from t2i_gcpo.eval.suites import Suite, SuiteItem, register_suite
from t2i_gcpo.eval.suites.asking import BadAnswer

SOURCE = "CodeGoat24/UniGenBench eval/src/eval_common.py (49d0bce)"
# the reference's checkpoint definitions (EXPLANATION_DICT_EN / _ZH) and templates
# (SYSTEM_PROMPT_EN_TEMPLATE / _ZH)
EXPLANATIONS_EN = {
    "Relationship - Comparison": "Comparison of attributes between two entities",
    "Relationship - Composition": "An entity is composed of one or more other entities",
    "Relationship - Inclusion": (
        "A container contains an entity; the container can also be a plane, e.g., a snake in a "
        "painting on a wall"
    ),
    "Relationship - Similarity": "Existence of similarities between different entities",
    "Compound - Imagination": "Things that are impossible in real life",
    "Compound - Feature Matching": "Different entities possess different types of attribute features",
    "Attribute - Size": (
        "Assessment of the subject's size, height, length, thickness, width, or tallness/shortness"
    ),
    "Attribute - Expression": (
        "Distinguishing expressions from facial actions; expressions must convey a clear emotion"
    ),
    "Attribute - Quantity": "Focuses on the challenge of depicting three or more items accurately",
    "Attribute - Material": "Evaluation of different material types and textures",
    "Attribute - Color": "Assessment of different colors",
    "Attribute - Shape": "Assessment of different shapes",
    "Entity Layout - Two-Dimensional Space": (
        "Arrangement and positioning of entities in two-dimensional space"
    ),
    "Entity Layout - Three-Dimensional Space": (
        "Arrangement and positioning of entities in three-dimensional space"
    ),
    "Action - Full-body (Character/Anthropomorphic)": (
        "Full-body actions by characters or anthropomorphized entities, such as running, diving, "
        "breakdancing, swinging, or hanging upside down"
    ),
    "Action - Hand (Character/Anthropomorphic)": (
        "Focuses on hand structure—checking if fingers are missing, broken, or distorted"
    ),
    "Action - Animal": "Actions performed by animals",
    "Action - Contact Interaction": "Physical interactions between entities",
    "Action - Non-contact Interaction": (
        "For example, two people making eye contact—testing if the model can accurately depict "
        "such interactions"
    ),
    "Action - State": "A sustained state of an entity, typically expressed with a verb",
    "Grammar - Negation": "Tests the model's understanding of negation grammar",
    "Grammar - Pronoun Reference": "Tests if the model can resolve ambiguous pronoun references correctly",
    "Grammar - Consistency": "Evaluation of shared attributes among entities",
    "World Knowledge": (
        "Covers knowledge of celebrities, architecture, basic domain knowledge, and internet slang. "
        "Celebrities with modern copyright risk should be avoided"
    ),
    "Style": "Art, painting, photography, design styles, and corresponding artist names",
    "Text Generation": (
        "The text content model needed to accurately generate without any omissions or extra words"
    ),
    "Logical Reasoning": "Requires the model to deeply understand the intent and perform reasoning",
}
EXPLANATIONS_ZH = {
    "关系-比较关系": "两者的属性对比",
    "关系-构成关系": "一个实体由另一种或几种实体构成",
    "关系-包含关系": "容器对实体的包含关系，容器也可以是平面的，比如：墙上的画里有一只蛇",
    "关系-相似关系": "不同实体中存在的相似关系",
    "复合考点-想象力": "现实生活中不可能发生的事情",
    "复合考点-不同实体特征匹配": "不同实体拥有不同类的属性特征",
    "实体布局-三维空间": "对于三维空间实体的摆放布局",
    "实体布局-二维空间": "对于二维空间实体的摆放布局",
    "属性-大小": "对主体 大小/高低/长短/粗细/宽窄/高矮",
    "属性-表情": "区分表情和脸部动作，脸部动作组成表情，但表情是一定要体现出某种情绪的。",
    "属性-数量": "重点考察三个或三个以上的数字难点",
    "属性-材质": "考察不同材质",
    "属性-颜色": "考察不同颜色",
    "属性-形状": "考察不同形状",
    "动作-人物/拟人全身动作": "人物或拟人全身性的动作，比如奔跑、跳水、跳街舞、荡秋千、倒挂金钩等",
    "动作-人物/拟人手部动作": "针对手部结构的考点，考核手指是否有缺失、崩坏等问题",
    "动作-动物动作": "动物的动作",
    "动作-实体间有接触互动": "各种实体间的有接触互动",
    "动作-实体间无接触互动": "比如两个人对视，考核模型能否把对视关系画对",
    "动作-状态": "实体持续的状态，一般是一个动词。",
    "语法-否定": "考察模型对于否定语法的掌握程度",
    "语法-代词指代": "这里的代词通常是有一些迷惑性的，考察模型能否正确对应",
    "语法-统一性": "实体共同属性的考察",
    "世界知识": "名人、建筑、基础的领域知识、网络流行语。其中名人不要使用当代有版权风险的名人",
    "风格": "艺术、绘画、摄影、设计风格，及对应艺术家名称",
    "逻辑推理": "需要模型深入理解意图并进行一定的推理",
    "文本生成": "考察模型能否准确生成不同语言，字体和长、短文字",
}
TEMPLATE_EN = (
    "You are a precise and objective English-language image description system. I will provide you with a "
    "prompt for image generation, as well as the corresponding generated image. You will be given a set of "
    "evaluation criteria (checkpoints) and their explanations that define the relevance between the prompt "
    "and the image. You must evaluate whether the generated image fulfills the requirements implied by each "
    "checkpoint in the prompt.\n\n            For each image, follow the steps below in order:\n\n"
    "            1. The prompt for the generated image is: 「{prompt}」. You are to analyze the image "
    "content in detail from the angles specified in {testpoint}. Detailed definitions of these checkpoints "
    "are provided here: {explanation}. The specific description of each checkpoint in the context of the "
    "prompt is: {test_explanation}. You must analyze whether the image meets the requirements for each "
    "checkpoint individually.\n\n            2. Based on the above analysis, determine whether the generated "
    "image satisfies each checkpoint in terms of its visual alignment with the prompt. If the image meets "
    "the requirements of a checkpoint, assign a score of 1 to that checkpoint; otherwise, assign a score of "
    "0.\n\n            Constraints:\n            - Only describe content that is directly visible; do not "
    "interpret, speculate, or infer any background story.\n"
    "            - Focus solely on visually verifiable details.\n"
    "            - Omit any uncertain or ambiguous elements.\n"
    "            - Even if mentioned in the input, do not describe abstract entities, emotions, or "
    "speculative ideas.\n\n            Please strictly follow the output format below:\n\n"
    "            <description>\n                <prompt>{prompt}</prompt>\n"
    "                <checkpoint>{testpoint}</checkpoint>\n"
    "                <analysis>A list using square brackets `[]`, where each element is a string of detailed "
    "analysis corresponding to one checkpoint, as required in Step 1. **Ensure the list length matches the "
    "number of checkpoints**. Each element should be a string representing the analysis for that specific "
    "checkpoint.</analysis>\n                <score>A list using square brackets `[]`, where each element is "
    "a binary score (0 or 1) corresponding to a checkpoint, as required in Step 2. **Ensure the list length "
    "matches the number of checkpoints**. Each element should be either 0 or 1, indicating whether the "
    "checkpoint was satisfied.</score>\n            </description>\n            "
)
TEMPLATE_ZH = (
    "你是一个精确且客观的中文图像描述系统。我会给你一段生成图像的提示词，以及对应的生成图像，同时对于生成图像"
    "与提示词之间相关性的考点及对应说明，你需要逐个考点来判断生成的图像是否遵从了提示词中所包含的对应考点要"
    "求。\n\n        针对每张图像，你需要按照顺序完成如下的任务：\n"
    "        1. 这张生成图像对应的提示词为「{prompt}」，你需要根据{testpoint}中的这些角度逐个对图像内容进行更"
    "进一步的详细分析，考点的详细说明如下：{explanation}，各个考点在这条prompt中对应的描述说明如下："
    "{test_explanation}, 你需要根据考点逐一判断生成图像是否满足了考点对应的要求\n"
    "        2. 综合上述回答，你需要逐个考点判断生成的图像在考点关注维度上是否符合输入的prompt，如果满足要求"
    "则该考点得分为1，否则为0\n\n        约束条件：\n        - "
    "仅描述直接可见的内容；不要进行解读、推测或暗示背景故事。\n        - 专注于能够确定性陈述的视觉细节。\n"
    "        - 省略不确定或不清晰的细节。\n        - 即使输入中存在，也不要描述抽象实体、情感或推测。\n\n"
    "        请严格遵循以下输出格式：\n\n        <description>\n            <prompt>{prompt}</prompt>\n"
    "            <checkpoint>{testpoint}</checkpoint>\n            "
    "<analysis>按照步骤1对于给定考点进行逐项详细分析，格式为一个方括号列表，**确保列表的长度与考点的数量相等"
    "**，每个元素为一个字符串，表示对于对应考点的分析</analysis>\n"
    "            <score>按照步骤2逐个对考点进行打分，格式为一个方括号列表，**确保列表的长度与考点的数量相等"
    "**，每个元素为0或者1，表示对应考点是否完成</score>\n        </description>\n        "
)
LANGUAGES = {  # column names, JSON keys and headers per language (the reference's LANG_CONFIGS)
    "en": {
        "prompt": "prompt_en",
        "dims": "sub_dims_en",
        "points": "Testpoints",
        "descs": "Testpoint Description",
        "theme": "Primary Categories",
        "explanations": EXPLANATIONS_EN,
        "template": TEMPLATE_EN,
        "header": "Checkpoints Defination",
        "desc_header": "Checkpoints Description",
    },
    "zh": {
        "prompt": "prompt_zh",
        "dims": "sub_dims_zh",
        "points": "考点",
        "descs": "考点对应描述",
        "theme": "一级垂类",
        "explanations": EXPLANATIONS_ZH,
        "template": TEMPLATE_ZH,
        "header": "考点说明",
        "desc_header": "考点描述说明",
    },
}


def read(path: Path) -> list[SuiteItem]:
    """The prompts of a UniGenBench CSV file (module docstring)."""
    import csv
    import io
    import json

    from t2i_gcpo.outdir import read_side_text

    if Path(path).suffix != ".csv":
        raise UserError(f"{path}: expected one of UniGenBench's CSV files (data/test_prompts_en.csv, …)")
    reader = csv.DictReader(io.StringIO(read_side_text(Path(path), follow=True)))
    columns = reader.fieldnames or []
    lang = next((k for k, c in LANGUAGES.items() if c["prompt"] in columns and c["dims"] in columns), None)
    if "index" not in columns or lang is None:
        raise UserError(
            f"{path}: expected UniGenBench's columns index, prompt_en, sub_dims_en (or prompt_zh, "
            f"sub_dims_zh), found {', '.join(columns) or 'none'}"
        )
    c = LANGUAGES[lang]
    items, seen = [], set()
    for n, row in enumerate(reader, start=2):  # line 1 is the header
        where = f"{path}:{n}"
        index = (row.get("index") or "").strip()
        if not index.isdigit():
            raise UserError(f"{where}: field 'index' must be a whole number, got {shorten(repr(index), 40)}")
        if index in seen:
            raise UserError(f"{where}: field 'index' {index} appears twice")
        seen.add(index)
        prompt = row.get(c["prompt"]) or ""
        if not prompt.strip():
            raise UserError(f"{where}: field '{c['prompt']}' is empty")
        try:
            dims = json.loads(row.get(c["dims"]) or "")
        except ValueError:
            raise UserError(f"{where}: field '{c['dims']}' is not a JSON object") from None
        if not isinstance(dims, dict):
            raise UserError(f"{where}: field '{c['dims']}' is not a JSON object")
        points, descs = dims.get(c["points"]), dims.get(c["descs"])
        if not isinstance(points, list) or not points or not all(isinstance(p, str) for p in points):
            raise UserError(
                f"{where}: field '{c['dims']}.{c['points']}' must be a non-empty list of checkpoints"
            )
        if (
            not isinstance(descs, list)
            or len(descs) != len(points)
            or not all(isinstance(d, str) for d in descs)
        ):
            raise UserError(
                f"{where}: field '{c['dims']}.{c['descs']}' must hold one description per "
                f"checkpoint ({len(points)})"
            )
        unknown = [p for p in points if p not in c["explanations"]]
        if unknown:
            raise UserError(
                f"{where}: field '{c['dims']}.{c['points']}': {unknown[0]!r} is not one of "
                f"UniGenBench's checkpoints"
            )
        theme = dims.get(c["theme"])
        items.append(
            SuiteItem(
                index,
                prompt,
                theme if isinstance(theme, str) and theme else "all",
                {"testpoints": points, "descriptions": descs, "language": lang},
            )
        )
    if not items:
        raise UserError(f"{path} holds no prompts")
    return items


def question(item: SuiteItem) -> str:
    """The reference's ``build_system_prompt``."""
    c = LANGUAGES[item.data["language"]]
    points, descs = item.data["testpoints"], item.data["descriptions"]
    explanation = (
        f"{c['header']}:\u300c" + "".join(f"\n{p}: {c['explanations'][p]}" for p in points) + "\n\u300d"
    )
    described = (
        f"{c['desc_header']}:\u300c" + "".join(f"\n{p}: {d}" for p, d in zip(points, descs)) + "\n\u300d"
    )
    return c["template"].format(
        prompt=item.prompt, testpoint=points, explanation=explanation, test_explanation=described
    )


def messages(item: SuiteItem, image_url: str) -> list[dict]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image_url}},
                {"type": "text", "text": question(item)},
            ],
        }
    ]


def _literal_list(text: str, tag: str) -> list:
    m = re.search(rf"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
    if m is None:
        raise BadAnswer(f"no <{tag}>…</{tag}> in the answer {shorten(text, 60)!r}")
    try:
        value = ast.literal_eval(m.group(1).strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise BadAnswer(f"<{tag}> is not a list: {shorten(m.group(1).strip(), 60)!r}") from None
    if not isinstance(value, (list, tuple)):
        raise BadAnswer(f"<{tag}> is not a list: {shorten(m.group(1).strip(), 60)!r}")
    return list(value)


def parse(answer: str, item: SuiteItem) -> dict:
    points = item.data["testpoints"]
    analysis, scores = _literal_list(answer, "analysis"), _literal_list(answer, "score")
    if len(analysis) != len(points) or len(scores) != len(points):
        raise BadAnswer(f"{len(analysis)} analyses and {len(scores)} scores for {len(points)} checkpoints")
    if any(isinstance(s, bool) or s not in (0, 1) for s in scores):
        raise BadAnswer(f"checkpoint scores must be 0 or 1, got {shorten(repr(scores), 60)}")
    met = [int(s) for s in scores]
    return {"score": sum(met) / len(met), "testpoints": points, "testpoint_scores": met}


def primary(point: str) -> str:
    return point.split("-", 1)[0].strip() if "-" in point else point


def summarize(rows: list[dict]) -> dict:
    prim: dict[str, list[int]] = {}
    sub: dict[str, list[int]] = {}
    for r in rows:
        for point, met in zip(r["testpoints"], r["testpoint_scores"]):
            for table, key in ((prim, primary(point)), (sub, point)):
                cell = table.setdefault(key, [0, 0])
                cell[0], cell[1] = cell[0] + met, cell[1] + 1
    dims = {k: c / t for k, (c, t) in prim.items()}
    themes: dict[str, list[float]] = {}
    for r in rows:
        themes.setdefault(r["category"], []).append(r["score"])
    return {
        "overall": sum(dims.values()) / len(dims),
        "primary_dimensions": dims,
        "sub_dimensions": {k: c / t for k, (c, t) in sorted(sub.items())},
        "categories": {k: sum(v) / len(v) for k, v in sorted(themes.items())},
    }


def reference_image(root: Path, item: SuiteItem, sample: int) -> Path:
    return Path(root) / f"{item.id}_{sample}.png"


register_suite(
    Suite(
        "unigenbench",
        "testpoints per prompt (style, attributes, relations, text, reasoning …) judged 0/1 (UniGenBench++)",
        SOURCE,
        "one of UniGenBench's CSV files, e.g. data/test_prompts_en.csv (github.com/CodeGoat24/UniGenBench)",
        read,
        summarize,
        messages=messages,
        parse=parse,
        reference_image=reference_image,
        images_per_prompt=4,
        temperature=0.0,
        max_tokens=4096,
    )
)
