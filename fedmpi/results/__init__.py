"""Result files (HDF5), their summary (``info``), plots, tables and exports.

``load(path)`` returns a :class:`Result` (metrics as numpy arrays, config as a dict, status);
``dataframe(paths, keys)`` puts many runs into one pandas DataFrame (see ``reader.py``).
"""

from .reader import Result, dataframe, load  # noqa: F401
