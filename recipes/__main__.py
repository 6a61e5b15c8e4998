import sys

from recipes.cli import main

if __name__ == "__main__":
    if sys.argv[1:2] == ["generate"]:
        from recipes.generate import main as generate

        generate(sys.argv[2:])
    else:
        main()
