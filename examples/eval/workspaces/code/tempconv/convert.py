"""The conversions. Every function rounds its result to one decimal place."""

ABSOLUTE_ZERO_C = -273.15


def c_to_f(celsius: float) -> float:
    """Celsius to Fahrenheit."""
    return round(celsius * 9 / 5 + 32, 1)


def f_to_c(fahrenheit: float) -> float:
    """Fahrenheit to Celsius."""
    return round((fahrenheit - 32) * 5 / 9, 1)


def c_to_k(celsius: float) -> float:
    """Celsius to Kelvin. Below absolute zero is an error."""
    if celsius < ABSOLUTE_ZERO_C:
        raise ValueError("below absolute zero")
    return round(celsius - ABSOLUTE_ZERO_C, 1)
