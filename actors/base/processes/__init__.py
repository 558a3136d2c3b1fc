"""The processes loopd starts: their trees killed (``trees``), a child that dies with its
parent (``tether``), a stop bounded in time (``stop_deadline``)."""
