pytest_plugins = ["tests.support.apiserver.fixtures"]
