//! The exceptions the module raises: defined in Python (`kvdrain/_errors.py`, so they carry
//! typed attributes) and imported here on first use.

pyo3::import_exception!(kvdrain._errors, ConfigError);
pyo3::import_exception!(kvdrain._errors, FullError);
pyo3::import_exception!(kvdrain._errors, DuplicateRequestError);
pyo3::import_exception!(kvdrain._errors, InvalidExpectError);
pyo3::import_exception!(kvdrain._errors, InvalidArgumentError);
pyo3::import_exception!(kvdrain._errors, InvalidRequestIdError);
pyo3::import_exception!(kvdrain._errors, AllocError);
pyo3::import_exception!(kvdrain._errors, UnknownRequestError);
pyo3::import_exception!(kvdrain._errors, ClockBackwardsError);
pyo3::import_exception!(kvdrain._errors, TopologyError);
pyo3::import_exception!(kvdrain._errors, PlanError);
