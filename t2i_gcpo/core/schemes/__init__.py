"""The credit schemes (docs/concepts/credit.md#registry): `registry` holds what a scheme is and how it is
called; every other module here is one built-in scheme, registering itself, and importing this package
imports them all (a new scheme is a new file, nothing else to edit). A scheme's module imports torch and
its maths inside the function, so the registry — names, needs, options — loads without torch: `--help`
lists it in 0.1 s (tests/test_help_fast.py)."""

import importlib
import pkgutil

from t2i_gcpo.core.schemes.registry import (
    CREDIT_SCHEMES,
    NEEDS,
    REWARD_NEEDS,
    USER_SCHEMES,
    CreditInputs,
    CreditScheme,
    CreditSchemeError,
    Option,
    SchemeOption,
    add_user_scheme,
    check_options,
    credit_scheme,
    credit_weights,
    get_scheme,
    pool_by_step,
    register_scheme,
    scheme_from_function,
)

for _module in pkgutil.iter_modules(__path__):  # sorted by name: the registry's order
    if _module.name != "registry":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "CREDIT_SCHEMES",
    "NEEDS",
    "REWARD_NEEDS",
    "USER_SCHEMES",
    "CreditInputs",
    "CreditScheme",
    "CreditSchemeError",
    "Option",
    "SchemeOption",
    "add_user_scheme",
    "check_options",
    "credit_scheme",
    "credit_weights",
    "get_scheme",
    "pool_by_step",
    "register_scheme",
    "scheme_from_function",
]
