from tempconv.convert import c_to_f, c_to_k, f_to_c


def test_boiling_point():
    assert c_to_f(100) == 212.0


def test_freezing_point():
    assert f_to_c(32) == 0.0


def test_kelvin():
    assert c_to_k(0) == 273.2
    # TODO: test below absolute zero
