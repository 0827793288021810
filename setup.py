from setuptools import find_packages, setup
setup(name="megatron_rlep", version="0.1.0", packages=find_packages(include=["megatron_rlep*"]))
