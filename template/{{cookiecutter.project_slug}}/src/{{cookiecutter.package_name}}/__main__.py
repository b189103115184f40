from {{ cookiecutter.package_name }}.main import main

main()
