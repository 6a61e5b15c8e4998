import sys

from recipes.cli import main

if __name__ == "__main__":
    if sys.argv[1:2] == ["generate"]:
        from recipes.generate import main as generate

        generate(sys.argv[2:])
    elif sys.argv[1:2] == ["eval"]:
        from recipes.evaluation.cli import main as evaluate

        evaluate(sys.argv[2:])
    else:
        main()
