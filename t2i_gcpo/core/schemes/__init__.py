"""The credit schemes (docs/concepts/credit.md#registry): `registry` holds what a scheme is and how it is
called; every other module here is one built-in scheme, registering itself (`CREDIT_SCHEMES`, a
t2i_gcpo/extensions.Registry, imports them all when first read: a new scheme is a new file, nothing else to
edit). A scheme's module imports torch and
its maths inside the function, so the registry — names, needs, options — loads without torch: `--help`
lists it in 0.1 s (tests/commands/test_help_fast.py)."""

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
