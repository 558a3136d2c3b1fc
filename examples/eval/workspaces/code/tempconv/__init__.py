"""Convert temperatures between Celsius, Fahrenheit and Kelvin."""

from tempconv.convert import c_to_f, c_to_k, f_to_c

__version__ = "1.4.2"
__all__ = ["c_to_f", "c_to_k", "f_to_c"]
