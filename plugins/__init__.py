"""The built-in plugins of attrib-bench, registered through entry points like any third party's."""
