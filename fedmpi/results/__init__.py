"""Result files (HDF5), their summary (``info``) and plots."""
